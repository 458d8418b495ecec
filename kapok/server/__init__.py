"""The node's network side: the drivers behind each protocol (assembled by ``kapok.node``)."""
