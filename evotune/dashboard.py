"""optuna-dashboard over an experiment's storage, bound to 127.0.0.1 unless told otherwise."""

from __future__ import annotations


def serve(storage_url: str, host: str = "127.0.0.1", port: int = 8080) -> None:
    """Serve the dashboard until interrupted. Needs the ``dashboard`` extra."""
    try:
        from optuna_dashboard import run_server
    except ImportError as exc:
        raise RuntimeError("the dashboard needs optuna-dashboard: pip install 'evotune[dashboard]'") from exc
    from evotune.study import make_storage

    run_server(make_storage(storage_url), host=host, port=port)
