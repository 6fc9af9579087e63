"""kafka-python at the boundary: client settings tuned for this pipeline, topic creation, error wrapping.

Only this module, the collector's Kafka sink and the loader import ``kafka``. Settings that matter:

* producer: ``acks=all``, idempotent, large batches with a short linger, compression (lz4 when installed,
  else gzip: kafka-python computes the CRC-32C of every record batch in pure Python, so smaller compressed
  batches are about four times faster to produce than uncompressed ones), topics never auto-created
  (``ubi`` creates them with ``kafka_partitions`` partitions, so keys always map to the same partitions);
* consumer: manual commits only, large fetches, ``max_poll_interval_ms`` doubling as the rebalance timeout.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterable
from typing import Any

from ubi_pipeline.schemas.errors import UbiError
from ubi_pipeline.schemas.settings import Settings

log = logging.getLogger("ubi.kafka")


class KafkaError(UbiError):
    """The Kafka broker could not be reached or refused a request (wraps kafka-python's errors)."""

_CODECS = ("gzip", "lz4", "snappy", "zstd")


def compression(setting: str) -> str | None:
    """The producer's ``compression_type`` for the ``kafka_compression`` setting."""
    value = (setting or "auto").lower()
    if value == "auto":
        return "lz4" if importlib.util.find_spec("lz4") is not None else "gzip"
    if value in ("none", ""):
        return None
    if value not in _CODECS:
        raise KafkaError(f"kafka_compression {setting!r}: expected auto, none, {', '.join(_CODECS)}")
    return value


def bootstrap_list(bootstrap: str) -> list[str]:
    servers = [s.strip() for s in bootstrap.split(",") if s.strip()]
    if not servers or any(":" not in s for s in servers):
        raise KafkaError(f"--bootstrap {bootstrap!r}: expected HOST:PORT[,HOST:PORT...]")
    return servers


def producer_config(settings: Settings) -> dict[str, Any]:
    """KafkaProducer settings: durable (acks=all, idempotent), batched, bounded in time."""
    timeout_ms = max(1000, int(settings.kafka_ack_timeout * 1000))
    return {
        "bootstrap_servers": bootstrap_list(settings.kafka_bootstrap),
        "client_id": "ubi-collector",
        "acks": "all",
        "linger_ms": settings.kafka_linger_ms,
        "batch_size": settings.kafka_batch_bytes,
        "max_request_size": max(settings.kafka_batch_bytes, 1024 * 1024) + 64 * 1024,
        "compression_type": compression(settings.kafka_compression),
        "request_timeout_ms": timeout_ms,
        # Give up inside the producer soon after the collector has spooled the batch anyway.
        "delivery_timeout_ms": 2 * timeout_ms + settings.kafka_linger_ms,
        "max_block_ms": timeout_ms,
        "reconnect_backoff_max_ms": 1000,
        "allow_auto_create_topics": False,
    }


def make_producer(settings: Settings) -> Any:
    """A connected KafkaProducer; raises :class:`KafkaError` when no broker answers."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaError as _KE

    try:
        return KafkaProducer(**producer_config(settings))
    except _KE as exc:
        raise KafkaError(f"cannot connect a producer to {settings.kafka_bootstrap}: {type(exc).__name__}: {exc}") from exc


def consumer_config(settings: Settings, group: str) -> dict[str, Any]:
    """KafkaConsumer settings of the loader: manual commits, big fetches, bounded rebalances."""
    poll_ms = settings.consumer_max_poll_interval_ms
    session_ms = min(settings.consumer_session_timeout_ms, poll_ms)
    return {
        "bootstrap_servers": bootstrap_list(settings.kafka_bootstrap),
        "client_id": "ubi-loader",
        "group_id": group,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "max_poll_records": max(500, min(settings.consumer_batch_records, 50_000)),
        "max_poll_interval_ms": poll_ms,
        # Tansu (and Kafka) complete a group's first join only after the rebalance timeout, which
        # kafka-python takes from max_poll_interval_ms: keep it short where joins must be quick (tests).
        "session_timeout_ms": session_ms,
        "heartbeat_interval_ms": max(100, session_ms // 3),
        "fetch_max_bytes": 64 * 1024 * 1024,
        "max_partition_fetch_bytes": 8 * 1024 * 1024,
        "fetch_max_wait_ms": 200,
        "request_timeout_ms": max(30_000, poll_ms + 5000),
        "allow_auto_create_topics": False,
        "reconnect_backoff_max_ms": 1000,
        "check_crcs": settings.consumer_check_crcs,
    }


def make_admin(settings: Settings) -> Any:
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError as _KE

    try:
        return KafkaAdminClient(bootstrap_servers=bootstrap_list(settings.kafka_bootstrap), client_id="ubi-admin",
                                request_timeout_ms=max(2000, int(settings.kafka_ack_timeout * 1000)))
    except _KE as exc:
        raise KafkaError(f"cannot reach a Kafka broker at {settings.kafka_bootstrap}: {type(exc).__name__}: {exc}") from exc


def ensure_topics(settings: Settings, names: Iterable[str]) -> list[str]:
    """Create the topics that do not exist yet (``kafka_partitions`` partitions, ``kafka_replication_factor``
    replicas each); return those created.

    Topics are never auto-created by clients, so their partition count is ours: keys keep mapping to the
    same partition. Needed after a broker that keeps no data (Tansu's memory storage) restarts, too.
    """
    from kafka.admin import NewTopic
    from kafka.errors import KafkaError as _KE
    from kafka.errors import TopicAlreadyExistsError

    admin = make_admin(settings)
    created: list[str] = []
    try:
        existing = set(admin.list_topics())
        for name in names:
            if name in existing:
                continue
            try:
                admin.create_topics([NewTopic(name, settings.kafka_partitions, settings.kafka_replication_factor)])
                created.append(name)
            except TopicAlreadyExistsError:
                pass  # another collector made it meanwhile
    except _KE as exc:
        raise KafkaError(f"cannot create topics on {settings.kafka_bootstrap}: {type(exc).__name__}: {exc}") from exc
    finally:
        admin.close()
    if created:
        log.info("created topics %s", ", ".join(created))
    return created
