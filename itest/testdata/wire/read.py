"""Reads a onceflow topic with third-party clients only, as another team would.

Usage: read.py BROKERS REGISTRY_URL TOPIC MODE COUNT [PROTO_DESCRIPTOR_B64 MESSAGE]

MODE is avro, protobuf, json-schema (Confluent's deserializers against the
registry), ce-binary-avro (the CloudEvents SDK's Kafka binding, Avro data) or
ce-structured (the CloudEvents SDK, structured mode). Prints one JSON line per
record: {"headers": {...}, "value": ..., "ce": {...}}.
"""

import base64
import json
import sys
import time

from confluent_kafka import Consumer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext


def main() -> None:
    brokers, registry, topic, mode, count = sys.argv[1:6]
    want = int(count)
    sr = SchemaRegistryClient({"url": registry})
    if mode in ("avro", "ce-binary-avro"):
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        deser = AvroDeserializer(sr)
    elif mode == "protobuf":
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer

        fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(sys.argv[6]))
        pool = descriptor_pool.DescriptorPool()
        fd = pool.Add(fdp)
        cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(sys.argv[7]))
        deser = ProtobufDeserializer(cls, {"use.deprecated.format": False})
    elif mode == "json-schema":
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer

        deser = JSONDeserializer(None, schema_registry_client=sr)
    else:
        deser = None

    c = Consumer({
        "bootstrap.servers": brokers,
        "group.id": "pyread-" + topic,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
    })
    c.subscribe([topic])
    got = 0
    deadline = time.time() + 60
    while got < want and time.time() < deadline:
        msg = c.poll(1.0)
        if msg is None:
            continue
        if msg.error():
            raise SystemExit(f"consume: {msg.error()}")
        headers = {k: v.decode() for k, v in (msg.headers() or [])}
        ctx = SerializationContext(topic, MessageField.VALUE, msg.headers())
        out: dict = {"headers": headers}
        if mode in ("avro", "json-schema"):
            out["value"] = deser(msg.value(), ctx)
        elif mode == "protobuf":
            from google.protobuf.json_format import MessageToDict

            out["value"] = MessageToDict(deser(msg.value(), ctx), preserving_proto_field_name=True)
        elif mode == "ce-binary-avro":
            from cloudevents.v1.kafka import KafkaMessage, from_binary

            ev = from_binary(
                KafkaMessage(headers={k: v for k, v in (msg.headers() or [])}, key=msg.key(), value=msg.value()),
                data_unmarshaller=lambda b: deser(b, ctx),
            )
            out["ce"] = {"id": ev["id"], "source": ev["source"], "type": ev["type"], "sequence": ev["sequence"]}
            out["value"] = ev.get_data()
        elif mode == "ce-structured":
            from cloudevents.v1.kafka import KafkaMessage, from_structured

            ev = from_structured(
                KafkaMessage(headers={k: v for k, v in (msg.headers() or [])}, key=msg.key(), value=msg.value()),
            )
            out["ce"] = {"id": ev["id"], "source": ev["source"], "type": ev["type"], "sequence": ev["sequence"]}
            out["value"] = ev.get_data()
        print(json.dumps(out, sort_keys=True), flush=True)
        got += 1
    c.close()
    if got < want:
        raise SystemExit(f"read {got} of {want} records within 60s")


if __name__ == "__main__":
    main()
