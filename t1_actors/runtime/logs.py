"""structlog set-up: JSON lines when stderr is not a terminal, readable console lines when it is.

Every line carries ``actor``, ``role`` and ``run_id``; request handlers bind ``trial_id`` and
``policy_version`` (when the request has them) through contextvars, which trio keeps per task.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(*, actor: str, role: str, run_id: str, level: str = "info",
                      json_lines: bool | None = None) -> structlog.typing.FilteringBoundLogger:
    """Configure structlog for this process and return a logger bound with actor, role and run id."""
    if json_lines is None:
        json_lines = not sys.stderr.isatty()
    renderer = (structlog.processors.JSONRenderer() if json_lines
                else structlog.dev.ConsoleRenderer(colors=True))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(actor=actor, role=role, run_id=run_id)
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger()  # the wrapper_class above
    return logger
