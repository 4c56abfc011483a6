//! EndpointSlices kept between builds, as last read (`SliceCache`).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::endpoints::{
    merge_slices, read_slice, EndpointInfo, MergedEndpoints, PortKey, SliceEndpoints,
};
use crate::model::ObjectKey;

/// Services with at least this many EndpointSlices keep each slice read (`SliceCache`): below,
/// comparing a kept slice costs about what reading it again does, and keeping it costs memory.
pub const SLICE_CACHE_MIN_SLICES: usize = 4;

/// The EndpointSlices of the Services that have many (`SLICE_CACHE_MIN_SLICES`), each as last
/// read (`endpoints::read_slice`), with a copy of the slice it was read from, and the Service's
/// endpoints merged from those reads (`endpoints::MergedEndpoints`). A change to one of a
/// 5,000-endpoint Service's 50 slices reads that slice's 100 endpoints again and patches them
/// into the merged lists (a linear pass, no sort), instead of merging 5,000.
///
/// A kept read is used only when its slice is equal to the one in the state (compared whole),
/// so the cache never depends on being told what changed, nor on the order of calls: the
/// translation stays a function of the state, and the same as without the cache.
#[derive(Default)]
pub struct SliceCache {
    by_service: HashMap<ObjectKey, KeptSlices>,
}

/// One Service's slices as last read, in name order, and their merge.
struct KeptSlices {
    slices: Vec<(EndpointSlice, SliceEndpoints)>,
    merged: MergedEndpoints,
}

impl SliceCache {
    /// Forgets the slices of Services for which `keep` is false.
    pub fn retain(&mut self, mut keep: impl FnMut(&ObjectKey) -> bool) {
        self.by_service.retain(|k, _| keep(k));
    }

    /// Forgets one Service's slices.
    pub fn forget(&mut self, service: &ObjectKey) {
        self.by_service.remove(service);
    }

    /// Services whose slices are kept.
    pub fn len(&self) -> usize {
        self.by_service.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_service.is_empty()
    }

    /// `merge_slices` of the Service's slices (`slices`, in name order), reading only those not
    /// kept as they are.
    pub(super) fn merged(
        &mut self,
        service: &ObjectKey,
        slices: Vec<&EndpointSlice>,
        node_name: &str,
        prefer_same_node_gate: bool,
        problems: &mut Vec<String>,
    ) -> Cow<'_, BTreeMap<PortKey, Vec<EndpointInfo>>> {
        let old = self.by_service.remove(service);
        if slices.len() < SLICE_CACHE_MIN_SLICES {
            return Cow::Owned(merge_slices(
                slices,
                node_name,
                prefer_same_node_gate,
                problems,
            ));
        }
        let read = |s: &EndpointSlice| read_slice(s, node_name, prefer_same_node_gate);
        let same_names = |kept: &KeptSlices| {
            kept.slices.len() == slices.len()
                && kept
                    .slices
                    .iter()
                    .zip(&slices)
                    .all(|((k, _), s)| k.metadata.name == s.metadata.name)
        };
        let kept = match old {
            // The same slices: those that changed are read again and patched in.
            Some(mut kept) if same_names(&kept) => {
                let mut patched = true;
                for (i, s) in slices.iter().enumerate() {
                    if kept.slices[i].0 == **s {
                        continue;
                    }
                    let new = ((*s).clone(), read(s));
                    let (_, was) = std::mem::replace(&mut kept.slices[i], new);
                    patched = patched && kept.merged.replace(&was, &kept.slices[i].1);
                }
                if !patched {
                    kept.merged = MergedEndpoints::new(kept.slices.iter().map(|(_, r)| r));
                }
                kept
            }
            // Slices added, removed or renamed: each read kept as it is used, then merged anew.
            old => {
                let mut old: HashMap<String, (EndpointSlice, SliceEndpoints)> = old
                    .into_iter()
                    .flat_map(|k| k.slices)
                    .map(|(s, r)| (s.metadata.name.clone().unwrap_or_default(), (s, r)))
                    .collect();
                let slices: Vec<(EndpointSlice, SliceEndpoints)> = slices
                    .into_iter()
                    .map(
                        |s| match old.remove(s.metadata.name.as_deref().unwrap_or("")) {
                            Some((copy, r)) if copy == *s => (copy, r),
                            _ => (s.clone(), read(s)),
                        },
                    )
                    .collect();
                let merged = MergedEndpoints::new(slices.iter().map(|(_, r)| r));
                KeptSlices { slices, merged }
            }
        };
        // The problems as `merge_read` gives them: each slice's, in order.
        for (_, r) in &kept.slices {
            problems.extend(r.problems().iter().cloned());
        }
        let kept = self.by_service.entry(service.clone()).insert_entry(kept);
        Cow::Borrowed(&kept.into_mut().merged.lists)
    }
}
