"""The elastic agent (torch's ``torch.distributed.elastic.agent``)."""
