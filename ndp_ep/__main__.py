from ndp_ep.cli import program

program()
