"""`slm serve`: an OpenAI-compatible HTTP server over the public API (docs/serve.md).

    protocol.py  request bodies -> typed requests; results -> OpenAI response shapes
    catalog.py   the compositions served: the active one (followed from refs/active), staged
    metrics.py   Prometheus metrics
    app.py       the ASGI app (Starlette): HTTP <-> catalog and scheduler, nothing more
    serve.py     uvicorn, signals and the bounded grace period

The scheduler (continuous batching, one decode step for all requests) is slm.engine.scheduler,
below the API: the server reaches it through slm.api.Runtime.scheduler.
"""
