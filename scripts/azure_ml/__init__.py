"""Azure ML job building shared by submit, deploy, sweeps and pipelines: images, launch rules, components, YAML."""
