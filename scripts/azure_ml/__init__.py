"""Azure ML job building shared by submit, deploy and sweeps: images, launch rules, the workspace client, job YAML."""
