"""Launching an agent from Python (torch's ``torch.distributed.launcher``)."""

from elastic.launcher.api import LaunchConfig, LaunchError, elastic_launch, launch_agent

__all__ = ["LaunchConfig", "LaunchError", "elastic_launch", "launch_agent"]
