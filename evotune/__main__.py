import sys

from evotune.model.preload import start_for

# guarded: a process that multiprocessing spawns (the build processes of tune-kernel) imports this module again
if __name__ == "__main__":
    # tune-model's workers' server (seconds of imports) starts before the command line's own imports (about a second)
    start_for(sys.argv[1:])
    from evotune.cli import main

    raise SystemExit(main())
