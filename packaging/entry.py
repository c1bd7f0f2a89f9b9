"""PyInstaller entry script: the frozen binary starts exactly like the console script."""

from meshctl.entry import run

if __name__ == "__main__":
    run()
