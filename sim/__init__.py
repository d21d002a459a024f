"""The simulator: the agent's ports on a simpy clock, worker and node models, scenarios.

``sim`` imports ``elastic``; ``elastic`` never imports ``sim`` (DESIGN §1).
"""
