"""What the collector and the loader share: the Kafka wire format and client, the store's admin protocol."""
