"""What stands between the network and the routes: connection limits and time-outs, the
secret key and its back-off, and the state of the node's client connections."""
