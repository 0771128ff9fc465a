"""Networks (plain `nn.Module`s) and the one LightningModule that trains them."""
