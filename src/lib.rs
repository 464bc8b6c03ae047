//! accel-container-runtime: an OCI runtime shim that writes accelerator devices into the
//! bundle's `config.json` and then hands the untouched argv to the low-level runtime.
