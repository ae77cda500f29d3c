import sys

try:
    from attnlab.cli import main
except KeyboardInterrupt:  # Ctrl-C while torch is still being imported
    print("attnlab: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
