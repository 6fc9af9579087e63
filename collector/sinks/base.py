"""What every sink does: take validated records, make them durable, say how it is doing.

A sink has two verbs (house style, "Sinks are small"): :meth:`Sink.submit` adds one validated batch and
returns a future that resolves, with the batch's :class:`~ubi_pipeline.collector.ingest.IngestResult`, only once the batch
(valid records *and* rejected items) is durable; :meth:`Sink.close` flushes and stops. If making a batch
durable fails, its future raises :class:`~ubi_pipeline.collector.errors.SinkUnavailable` and nothing is acknowledged.

Routes only see this interface, so the same routes serve the embedded DuckDB store and Kafka. Routes that
need the local database (``/v1/failed``, the store admin routes) use :attr:`Sink.store`, which is ``None``
for sinks without one; those routes then answer 501.
"""

from __future__ import annotations

import abc
import asyncio
from concurrent.futures import Future
from typing import Any, ClassVar

from ubi_pipeline.collector.ingest import IngestResult, Prepared, Validated
from ubi_pipeline.store.duckdb_store import Store


class Sink(abc.ABC):
    """Base of every sink; subclasses implement :meth:`submit`, :meth:`keep_unparseable` and :meth:`close`."""

    #: Short name used by ``--sink``, ``/healthz`` and metric labels.
    name: ClassVar[str] = "sink"
    #: The local store, when the sink writes to one (serves ``/v1/failed`` and the admin routes).
    store: Store | None = None
    #: Whether :meth:`submit_prepared` takes stored rows built without models (the columnar path,
    #: ``ubi_pipeline.collector.fastpath.prepare_items``); sinks that need the models (Kafka) do not.
    takes_rows: ClassVar[bool] = False

    @abc.abstractmethod
    def submit(self, batch: Validated, *, source: str) -> Future[IngestResult]:
        """Queue one validated batch; the future resolves once it is durable (raises SinkUnavailable if not)."""

    def write(self, batch: Validated, *, source: str) -> IngestResult:
        """Submit one batch and wait until it is durable."""
        return self.submit(batch, source=source).result()

    async def submit_async(self, batch: Validated, *, source: str) -> IngestResult:
        """:meth:`submit` from an event loop: wait (without blocking the loop) until the batch is durable.

        What the collector's routes call. Sinks may override it to answer many requests at once.
        """
        return await asyncio.wrap_future(self.submit(batch, source=source))

    async def submit_prepared(self, prepared: Prepared) -> IngestResult:
        """Queue one batch already turned into stored rows and wait until it is durable (:attr:`takes_rows`)."""
        raise NotImplementedError(f"the {self.name} sink takes validated models only")

    @abc.abstractmethod
    def keep_unparseable(self, body: bytes, *, source: str, reason: str, kind: str = "body") -> Future[None]:
        """Keep a whole body that could not be parsed (within the size limit) with its reason."""

    def health(self) -> dict[str, Any]:
        """State for ``/healthz``: at least ``{"sink": name, "ok": bool}``; anything else is shown as is."""
        return {"sink": self.name, "ok": True}

    def gauges(self) -> dict[str, float]:
        """Numbers for ``/metrics`` (exported as ``ubi_sink_<name>`` gauges), e.g. spool depth."""
        return {}

    @abc.abstractmethod
    def close(self) -> None:
        """Flush what is pending, then release resources; later submits raise SinkUnavailable."""
