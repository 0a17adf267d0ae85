//! `corral certs`: the cluster CA and the certificates of ctld and agents.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use corral_proto::error_chain as chain;
use corral_proto::tls::{self, Role, CTLD_NAME};

use super::{fail, parse};

const CMD: &str = "corral certs";

/// Create a cluster CA and sign certificates with it.
#[derive(Debug, Parser)]
#[command(name = "corral certs")]
pub struct CertsArgs {
    #[command(subcommand)]
    pub what: What,
}

#[derive(Debug, Subcommand)]
pub enum What {
    /// Create a CA (ca.pem, ca.key) in DIR.
    Init { dir: PathBuf },
    /// Sign a certificate for NAME (a node, or corral-ctld) with DIR's CA.
    Issue {
        dir: PathBuf,
        /// Node name, or corral-ctld for the controller.
        name: String,
        /// A controller certificate (also named corral-ctld).
        #[arg(long)]
        controller: bool,
    },
}

pub fn main(args: &[OsString]) -> i32 {
    let mut args = args.to_vec();
    args[0] = CMD.into();
    let a: CertsArgs = match parse(CMD, &args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    match a.what {
        What::Init { dir } => match tls::init_ca(&dir) {
            Ok(()) => {
                crate::say!("cluster CA created in {}", dir.display());
                0
            }
            Err(e) => fail(CMD, chain(&e)),
        },
        What::Issue {
            dir,
            name,
            controller,
        } => {
            let role = if controller || name == CTLD_NAME {
                Role::Controller
            } else {
                Role::Agent
            };
            match tls::issue(&dir, &name, role) {
                Ok(f) => {
                    crate::say!("{} and {}", f.cert.display(), f.key.display());
                    0
                }
                Err(e) => fail(CMD, chain(&e)),
            }
        }
    }
}
