"""One-off investigations: single-purpose studies whose results are recorded in
docs/performance.md, docs/benchmarks.md, docs/caching.md and docs/api.md.

They are scripts, not product code and not the benchmark suite (`python -m bench`): each
answers one question about the engine, may read engine internals to do so, and is kept so
its recorded numbers can be re-measured. Run one from the repository root as a module, so
that `gateway` and `bench` import from the checkout:

    python -m docs.investigations.NAME --help

Their tests live in tests/investigations/.
"""
