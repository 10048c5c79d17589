//! Assembling PTX with ptxas and listing its SASS with cuobjdump, for the tests that check what
//! the assembler makes of a program (kda-dsl's Hopper programs, kda-kernels' Hopper GEMM).

use std::ffi::{OsStr, OsString};
use std::process::Command;

/// What ptxas and cuobjdump made of one module.
pub struct Assembled {
    /// ptxas's log (`-v`: registers, spills, warnings).
    pub log: String,
    /// The SASS, when a cuobjdump was given.
    pub sass: Option<String>,
}

/// Assembles `ptx` for `arch` (`sm_90a`, ...) with `ptxas -v` in a temporary folder named after
/// `name`, then lists its SASS with `cuobjdump` when given; an error (with the tool's output)
/// when either fails.
pub fn assemble(
    ptxas: &OsStr,
    cuobjdump: Option<&OsStr>,
    arch: &str,
    name: &str,
    ptx: &str,
) -> Result<Assembled, String> {
    let dir = std::env::temp_dir().join(format!("kda-assemble-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let src = dir.join(format!("{name}.ptx"));
    let cubin = src.with_extension("cubin");
    std::fs::write(&src, ptx).map_err(|e| e.to_string())?;
    let out = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .args(["-v", "-o"])
        .arg(&cubin)
        .arg(&src)
        .output()
        .map_err(|e| format!("ptxas: {e}"))?;
    let log = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("{name}: ptxas failed:\n{log}"));
    }
    let sass = match cuobjdump {
        None => None,
        Some(tool) => {
            let out = Command::new(tool).arg("-sass").arg(&cubin).output().map_err(|e| format!("cuobjdump: {e}"))?;
            if !out.status.success() {
                return Err(format!("{name}: cuobjdump failed: {}", String::from_utf8_lossy(&out.stderr)));
            }
            Some(String::from_utf8_lossy(&out.stdout).to_string())
        }
    };
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Assembled { log, sass })
}

/// ptxas and cuobjdump from `KDA_PTXAS` and `KDA_CUOBJDUMP` (`.ci/run` sets both), or `None`
/// after a line saying that `what` is skipped without them; a failure instead when
/// `KDA_REQUIRE_PTXAS` is set.
#[allow(dead_code)] // each test binary including this file uses what it needs
pub fn tools_or_skip(what: &str) -> Option<(OsString, OsString)> {
    let required = std::env::var_os("KDA_REQUIRE_PTXAS").is_some();
    match (std::env::var_os("KDA_PTXAS"), std::env::var_os("KDA_CUOBJDUMP")) {
        (Some(ptxas), Some(cuobjdump)) => Some((ptxas, cuobjdump)),
        _ => {
            assert!(!required, "KDA_REQUIRE_PTXAS is set but KDA_PTXAS or KDA_CUOBJDUMP is not");
            println!("skipped: set KDA_PTXAS and KDA_CUOBJDUMP to assemble {what}");
            None
        }
    }
}
