"""Structured JSON logs (structlog). Every outcome carries the event key and, in the
worker, the business keys; payloads and secrets are never logged."""

from __future__ import annotations

import logging
import sys
import traceback

import structlog

from relaybox import tracing

__all__ = ["configure_logging", "debug_enabled", "error_text", "short_error"]

_debug = False


def debug_enabled() -> bool:
    """Whether debug lines are wanted: hot paths skip building them otherwise."""
    return _debug


class _StderrLoggerFactory:
    """Loggers that write to ``sys.stderr`` as it is when they log (an application
    or its test runner may replace it after relaybox configured logging)."""

    def __call__(self, *args: object) -> structlog.PrintLogger:
        return structlog.PrintLogger(sys.stderr)


def configure_logging(
    level: str = "info", *, json: bool = True, follow_stderr: bool = False
) -> None:
    global _debug
    _debug = level.lower() == "debug"
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            tracing.structlog_processor,  # trace_id / span_id while a span is current
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=(
            _StderrLoggerFactory() if follow_stderr else structlog.PrintLoggerFactory(sys.stderr)
        ),
        cache_logger_on_first_use=False,
    )


def error_text(exc: BaseException) -> str:
    """An exception and where it was raised, for an event's ``last_error``: no local
    variables, no payload."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" at {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else ""
    return f"{type(exc).__name__}: {str(exc)[:500]}{where}"


def short_error(exc: BaseException) -> str:
    """An error's class and first line (no parameters, payloads or secrets), for logs."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {first[:200]}"
