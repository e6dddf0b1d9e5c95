"""The multi-turn RL loop (not implemented yet)."""


def run(config, workdir):
  del config, workdir
  raise NotImplementedError(
      "mode=train is not implemented yet: the multi-turn RL loop lands with its issue. "
      "Nothing was trained and nothing was written.")
