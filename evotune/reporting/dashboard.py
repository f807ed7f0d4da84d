"""optuna-dashboard over an experiment's storage, bound to 127.0.0.1 unless told otherwise.

The studies name their objective (``study.set_metric_names``, see
:data:`evotune.storage.study.METRIC_NAME`), so the dashboard labels its axes and
columns with it; each trial's start and completion are the evaluation's own,
so its duration is the time the evaluation took.

optuna-dashboard (0.21) still routes ``/dashboard/studies/ID/trialTable``, the
address of its former trial-table page, but draws nothing there: its pages no
longer include one. An old link or bookmark to that address is redirected to
the trial list (``/dashboard/studies/ID/trials``), which shows every trial with
its value, parameters and user attributes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import optuna

TABLE_PAGE = re.compile(r"^(/dashboard/studies/\d+)/trialTable/?$")

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class DashboardMissing(RuntimeError):
    """optuna-dashboard is not installed."""


def require_dashboard() -> None:
    """DashboardMissing, saying how to install it, unless optuna-dashboard can be imported."""
    try:
        import optuna_dashboard  # noqa: F401
    except ImportError:
        raise DashboardMissing("the dashboard needs optuna-dashboard: pip install '.[dashboard]' in the evotune "
                               "clone") from None


def app(storage: str | optuna.storages.BaseStorage) -> WsgiApp:
    """The dashboard as a WSGI application over ``storage`` (a URL: an existing storage, opened without creating
    anything). Needs the ``dashboard`` extra."""
    require_dashboard()
    from optuna_dashboard import wsgi

    from evotune.storage.study import open_existing

    return redirect_table_page(wsgi(open_existing(storage) if isinstance(storage, str) else storage))


def redirect_table_page(inner: WsgiApp) -> WsgiApp:
    """``inner``, with the blank trial-table address sent to the trial list (see the module docstring)."""

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        match = TABLE_PAGE.match(environ.get("PATH_INFO", ""))
        if environ.get("REQUEST_METHOD", "GET") in ("GET", "HEAD") and match:
            start_response("302 Found", [("Location", f"{match.group(1)}/trials"), ("Content-Length", "0")])
            return [b""]
        return inner(environ, start_response)

    return wrapped


def serve(storage: str | optuna.storages.BaseStorage, host: str = "127.0.0.1", port: int = 8080) -> None:
    """Serve the dashboard until interrupted. Needs the ``dashboard`` extra."""
    application = app(storage)
    from bottle import run  # optuna-dashboard's own server, a dependency of it

    run(application, host=host, port=port)
