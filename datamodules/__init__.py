"""One LightningDataModule per dataset, and the helpers they share."""
