from fireviz.cli import run

run()
