"""A WAN on one machine: network namespaces joined by a userspace switch that delays each packet.

- :mod:`lab.matrix`: who the hosts are and the RTT between every pair (default: the paper's
  Table 1 cities, from great-circle distance), scaled to fit a small machine.
- :mod:`lab.netns`: one namespace per host, each with a TUN device whose fd the switch holds.
- :mod:`lab.switch`: the forwarder that holds every packet for its pair's one-way delay.
- :mod:`lab.wan`: a running lab (namespaces + switch process) as one context manager.
- :mod:`lab.run`: ``make lab``: the switch, mosquitto, the planner and one agent per host.
- :mod:`lab.services`: the lab's processes; a ``--keep`` lab reports a death and goes on.
- :mod:`lab.ctl`: ``status`` and ``restart`` (flags added or dropped) of a running ``--keep``
  lab's services.
- :mod:`lab.endpoints`: what an operator reaches: serve's dashboard and ``/metrics``, the broker.
- :mod:`lab.train`: launch examples/train_gpt.py as a placement, on loopback or in the lab.
- :mod:`lab.accuracy`: configured vs measured RTT with real ``ping``.

See lab/README.md.
"""
