from deployer.cli import run

run()
