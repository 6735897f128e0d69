"""`slm serve`: an OpenAI-compatible HTTP server over the public API (docs/serve.md).

    protocol.py  request bodies -> typed requests; results -> OpenAI response shapes
    catalog.py   the compositions served: the active one (followed from refs/active), staged
    engine.py    the scheduler: continuous batching, one decode step for all requests
    metrics.py   Prometheus metrics
    app.py       the ASGI app (Starlette): HTTP <-> catalog and engine, nothing more
    serve.py     uvicorn, signals and the bounded grace period
"""
