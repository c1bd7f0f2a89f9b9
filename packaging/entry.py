"""PyInstaller entry script: the frozen binary starts exactly like the console script."""

from meshctl.cli import run

if __name__ == "__main__":
    run()
