"""The nnx-pool regression kit: a version-stamped regression batch and its baseline."""
