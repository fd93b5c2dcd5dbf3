"""Reference implementation of the distributed deep-learning runtime the lab teaches.

One room per concept: ``backend`` (array namespaces), ``comm`` (communicators and
collectives), ``bench`` (measured figures for the site).
"""
