"""The module of index.py that grows its index: one batch of small lists,
keyed by number, per call."""


def add_batch(index, batch, size):
    for key in range(batch * size, (batch + 1) * size):
        index[key] = [key, "item-%d" % key, (key, batch)]  # grows the index
