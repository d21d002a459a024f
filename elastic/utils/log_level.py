"""torch's ``utils.log_level``: the level elastic's loggers start at."""

__all__ = ["get_log_level"]


def get_log_level() -> str:
    """``"WARNING"``: the default level of ``elastic.utils.logging.get_logger``'s loggers."""
    return "WARNING"
