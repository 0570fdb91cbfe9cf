"""``python -m grpo_cli``: the same CLI as the ``grpo-cli`` console script."""

from grpo_cli.cli import main

if __name__ == "__main__":
    main()
