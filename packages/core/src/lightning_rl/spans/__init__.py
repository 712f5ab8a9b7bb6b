"""How spans travel to a store: the batching writer and the OTLP/HTTP decoder.

Neither keeps anything: ``SpanWriter`` queues spans from the gateway, tracing and the runner and
hands them to any ``LightningStore`` in batches; ``otlp`` turns an OpenTelemetry export request
into spans for the store server's ``POST /v1/traces``. They sit on the store's floor (the gateway
and the store server use them) but outside the store package, which holds storage only.
"""

from __future__ import annotations

from lightning_rl.spans.writer import SpanWriter, WriterStats

__all__ = ["SpanWriter", "WriterStats"]
