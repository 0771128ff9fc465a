"""The azure extra's tests: Azure ML jobs, pipelines, assets and endpoints built offline, the SDK over a fake REST
API."""
