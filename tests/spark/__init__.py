"""The spark extra's tests: the fit on Spark (TorchDistributor) and scoring with spark_udf, on a local-cluster
master."""
