"""Reference implementation of the distributed deep-learning runtime the lab teaches.

One room per concept: ``backend`` (array namespaces), ``comm`` (communicators, collectives,
cost model, simulated network, cluster simulator, virtual cluster), ``graph`` (dataflow
graphs, autodiff, sessions, eager mode), ``train`` (data-parallel training), ``bench``
(measured figures for the site).
"""
