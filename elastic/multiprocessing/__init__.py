"""Starting, watching and logging worker processes (torch's ``elastic.multiprocessing``)."""
