"""Read TensorBoard event files (TFRecord framing + tensorboardX's protobufs), for assertions."""

from __future__ import annotations

import struct
from collections import defaultdict
from pathlib import Path

from tensorboardX.proto import event_pb2


def read_events(run: Path) -> tuple[dict[str, list[tuple[int, float]]], set[str]]:
    """Scalars by tag as (step, value), and the names of plugins that wrote summaries."""
    scalars: dict[str, list[tuple[int, float]]] = defaultdict(list)
    plugins: set[str] = set()
    for path in sorted(run.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            record = data[pos + 12 : pos + 12 + length]
            pos += 12 + length + 4
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name:
                    plugins.add(value.metadata.plugin_data.plugin_name)
                if value.HasField("simple_value"):
                    scalars[value.tag].append((event.step, value.simple_value))
    return scalars, plugins
