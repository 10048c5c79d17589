//! A program's arguments as the simulated blocks read them: each parameter's value by name,
//! the tensors' bytes (taken out of the caller's arguments for the run and handed back after
//! it), and the TMA maps over them (given, or made from the compiler's signature).

use super::*;

/// The arguments bound to a program's parameters.
pub(super) struct BoundArgs {
    /// Each parameter's value: a scalar's bits, a tensor's tagged address, a map's tag.
    pub(super) params: HashMap<String, u64>,
    /// The tensors' bytes, by slot.
    pub(super) globals: Vec<Vec<u8>>,
    /// The tensors' argument names, by slot.
    pub(super) names: Vec<String>,
    /// The slot of each tensor argument, in argument order.
    pub(super) tensor_slot: Vec<usize>,
    /// Each tensor map: the slot of the tensor it maps, and the map.
    pub(super) maps: Vec<(usize, crate::tensor_map::TensorMap)>,
}

/// Binds `args` (by the parameters' kernel names) to `prog`'s parameters, taking the tensors'
/// bytes out of `args`; an error for a map over no tensor, a map the hardware would refuse, or
/// a parameter with no argument.
pub(super) fn bind(prog: &ThreadProgram, args: &mut [(String, SimArg)]) -> Result<BoundArgs, SimError> {
    let mut params = HashMap::new();
    let mut globals: Vec<Vec<u8>> = vec![];
    let mut names = vec![];
    let mut tensor_slot = vec![];
    let mut maps = vec![];
    let fail = |message: String| SimError { message, loc: SrcLoc::default(), block: [0; 3], thread: 0 };
    for (name, a) in args.iter_mut() {
        let pname = crate::lower::param_name(name);
        let v = match a {
            SimArg::TensorMap { .. } => continue,
            SimArg::Tensor(bytes) => {
                globals.push(std::mem::take(bytes));
                names.push(name.clone());
                tensor_slot.push(globals.len() - 1);
                (globals.len() as u64) << GLOBAL_SHIFT
            }
            SimArg::I32(v) => *v as u32 as u64,
            SimArg::I64(v) => *v as u64,
            SimArg::F32(v) => v.to_bits() as u64,
        };
        params.insert(pname, v);
    }
    // Tensor maps after the tensors they name.
    for (name, a) in args.iter() {
        if let SimArg::TensorMap { tensor, map } = a {
            map.check().map_err(|e| fail(format!("argument `{name}`: {e}")))?;
            let slot = names
                .iter()
                .position(|n| n == tensor)
                .ok_or_else(|| fail(format!("argument `{name}`: no tensor argument `{tensor}` to map")))?;
            maps.push((slot, *map));
            params.insert(crate::lower::param_name(name), tma::MAP_TAG | (maps.len() as u64 - 1));
        }
    }
    // The compiler's maps not given as arguments: made from their signature over the tensor
    // argument they name and its extents, as the runtime makes them.
    for (pname, kind) in &prog.params {
        let ParamKind::TensorMap(sig) = kind else { continue };
        if params.contains_key(pname) {
            continue;
        }
        let slot = names
            .iter()
            .position(|n| *n == sig.tensor)
            .ok_or_else(|| fail(format!("tensor map `{}`: no tensor argument `{}`", sig.name, sig.tensor)))?;
        let extent = |e: &String| -> Result<u64, SimError> {
            let value = e.parse::<i64>().ok().or_else(|| {
                args.iter().find_map(|(n, a)| match a {
                    SimArg::I32(v) if n == e => Some(i64::from(*v)),
                    _ => None,
                })
            });
            value
                .and_then(|v| u64::try_from(v).ok())
                .ok_or_else(|| fail(format!("tensor map `{}`: no extent `{e}` among the arguments", sig.name)))
        };
        let extents = sig.extents.iter().map(extent).collect::<Result<Vec<u64>, SimError>>()?;
        let map = sig.map(&extents).ok_or_else(|| {
            fail(format!(
                "tensor map `{}`: {} extents for a box of {} axes",
                sig.name,
                extents.len(),
                sig.box_extent.len()
            ))
        })?;
        map.check().map_err(|e| fail(format!("tensor map `{}` over `{}`: {e}", sig.name, sig.tensor)))?;
        maps.push((slot, map));
        params.insert(pname.clone(), tma::MAP_TAG | (maps.len() as u64 - 1));
    }
    for (pname, _) in &prog.params {
        if !params.contains_key(pname) {
            return Err(fail(format!("no argument for parameter `{pname}`")));
        }
    }
    Ok(BoundArgs { params, globals, names, tensor_slot, maps })
}

/// Puts the tensors' bytes (as the run left them) back into `args`.
pub(super) fn hand_back(args: &mut [(String, SimArg)], mut globals: Vec<Vec<u8>>, tensor_slot: &[usize]) {
    let mut gi = 0;
    for (_, a) in args.iter_mut() {
        if let SimArg::Tensor(bytes) = a {
            *bytes = std::mem::take(&mut globals[tensor_slot[gi]]);
            gi += 1;
        }
    }
}
