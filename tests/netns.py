"""Several hosts on one machine, for the tests: :mod:`elastic.real.netns` (``elastic
real`` runs a scenario's partition on the same implementation)."""

from elastic.real.netns import SUBNET, Hosts, available

__all__ = ["SUBNET", "Hosts", "available"]
