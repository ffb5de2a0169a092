"""Benchmarks and load tools (`vision-gateway bench ...`). They talk to real servers over HTTP
on 127.0.0.1 only, are bounded in requests and time, and print their progress."""
