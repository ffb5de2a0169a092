"""Hostile clients against a real `vision-gateway serve` subprocess on 127.0.0.1.

Two servers, each started once for its tests (conftest.py, test_open_server.py):
- `hostile` (auth on, a 2 MiB body cap, one allowed media dir, no private URLs) takes the
  table of hostile requests (test_table.py), raw-socket requests (test_raw_socket.py), the
  side endpoints' auth (test_side_auth.py) and arbitrary JSON bodies (test_property.py), and
  must come out of all of it healthy and idle;
- `open_server` (private URLs allowed) takes image URLs that never answer and clients that go
  away (test_open_server.py).

Not covered here: a redirect from an allowed first hop to a loopback address cannot be staged
end to end (every address a test can serve from is loopback, so the first hop is either refused
or --allow-private-urls allows the whole chain); tests/gateway/media/test_url_fetch.py pins it
with an address policy that treats 127.0.0.2 as internal. SIGTERM behaviour is in
tests/gateway/test_lifecycle.py.

Only servers these tests start on 127.0.0.1 are contacted.
"""
