from evotune.cli import main

# guarded: a process that multiprocessing spawns (the build processes of tune-kernel) imports this module again
if __name__ == "__main__":
    raise SystemExit(main())
