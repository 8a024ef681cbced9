"""Sources and sinks: recorded-topic files (the embedded default) and Kafka topics."""

from __future__ import annotations

from .base import BatchRolledBack, FatalError, Sink, Source, StartupError

__all__ = ["BatchRolledBack", "FatalError", "Sink", "Source", "StartupError", "open_sink",
           "open_source"]


def open_source(settings) -> Source:
    """The configured source; raises StartupError."""
    if settings.source.type == "file":
        from .files import FileSource

        return FileSource(settings.source.path)
    from .access import check_access
    from .kafka import KafkaSource, validate_client_config

    topics = [t.strip() for t in settings.source.topic.split(",") if t.strip()]
    validate_client_config(settings.consumer_config())
    check_access(settings, transactional=_transactional(settings))
    return KafkaSource(settings.consumer_config(), topics)


def _transactional(settings) -> bool:
    return settings.delivery.mode == "exactly_once" and settings.source.type == "kafka"


def open_sink(settings) -> Sink:
    """The configured sink; transactional when delivery is exactly once from Kafka to Kafka.
    Raises StartupError."""
    s = settings.sink
    if s.type == "file":
        from .files import FileSink

        return FileSink(s.path, s.dead_letter_path, shadow_path=s.shadow_path)
    from .kafka import KafkaSink, topic_max_bytes, validate_client_config

    transactional = _transactional(settings)
    conf = settings.producer_config(transactional)
    validate_client_config(conf)
    if settings.source.type != "kafka":  # else checked with the source
        from .access import check_access

        check_access(settings, transactional=False)
    topics = [s.topic, s.dead_letter_topic] + ([s.shadow_topic] if settings.model.shadow_path
                                              else [])
    from .access import transactional_id_permission

    return KafkaSink(conf, s.topic, s.dead_letter_topic, transactional,
                     topic_max_bytes(conf, topics), shadow_topic=s.shadow_topic
                     if settings.model.shadow_path else None,
                     transactional_id_acl=transactional_id_permission(settings))
