"""The transfer runtime outside a model server: SGLang's runtime context for a bare
process, the KV pool (torch tensors registered with NIXL), and bare NIXL agents."""
