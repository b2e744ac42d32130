from orchestrator.cli import command

command()
