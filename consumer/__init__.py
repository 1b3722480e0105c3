"""deltamirror.consumer: incremental snapshots, cache invalidation and the Spark change-feed source."""
