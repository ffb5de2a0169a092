"""Benchmarks and load tools (`python -m bench ...`, run from a checkout; not in the wheel).
They talk to real servers over HTTP on 127.0.0.1 only (or a `--base-url` you name), are
bounded in requests and time, and print their progress."""
