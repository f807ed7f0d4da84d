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

import errno
import re
import socket
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIServer, make_server

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


class DashboardAddressError(OSError):
    """The dashboard's address cannot be listened on (the port is in use, the host is not this machine's)."""


def listen(storage: str | optuna.storages.BaseStorage, host: str = "127.0.0.1", port: int = 8080) -> WSGIServer:
    """The dashboard's HTTP server, bound to ``host:port`` and not serving yet (``serve_forever()``), so an
    address that cannot be had is known before one is announced. Needs the ``dashboard`` extra.

    :class:`DashboardAddressError`, one line naming the address, when it cannot be bound."""
    application = app(storage)
    server_class = _WSGIServerV6 if ":" in host else WSGIServer
    try:
        return make_server(host, port, application, server_class=server_class)
    except (OSError, OverflowError) as exc:  # OverflowError: a port outside 0-65535
        reason = getattr(exc, "strerror", None) or str(exc)
        if getattr(exc, "errno", None) == errno.EADDRINUSE:
            reason += "; choose another --port"
        raise DashboardAddressError(f"--port: cannot listen on {host}:{port} ({reason})") from None


def serve(storage: str | optuna.storages.BaseStorage, host: str = "127.0.0.1", port: int = 8080) -> None:
    """Serve the dashboard until interrupted. Needs the ``dashboard`` extra."""
    with listen(storage, host, port) as server:
        server.serve_forever()


class _WSGIServerV6(WSGIServer):
    address_family = socket.AF_INET6
