"""elastic: an elastic training agent, simulation-first.

The agent (``elastic.agent``), rendezvous (``elastic.rendezvous``), timers
(``elastic.timer``) and the multiprocessing helpers keep the names of
``torch.distributed.elastic``; ``elastic run`` is a drop-in for ``torchrun``.  The
simulator lives in the separate ``sim`` package and drives the same agent code.
"""

__version__ = "0.1.0"
