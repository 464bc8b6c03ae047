//! `accel-ctk` subcommands, one module each. They sit above the runtime's modules and reuse
//! them (config, profiles, discovery, planning); nothing here is used by the runtime binary.

pub mod cdi;
pub mod checkpoint;
pub mod doctor;
pub mod list;
pub mod runtime;
pub mod system;
