//! A GPU's budget with host memory's beside it, on random tiny models (on
//! the CPU backend: the host tier is the same code whatever the device):
//! the streamed layers that fit host memory are read once and copied on
//! every pass, the others are read from the disk; the logits are bit for
//! bit the resident model's; the report and the monitor say which bytes
//! came from where; a host budget that cannot hold the read buffers is
//! refused.

use crate::common;

use arbor_backend_candle::CandleBackend;
use arbor_gguf::{GgmlType, GgufFile};
use arbor_model::Layout;
use arbor_pipeline::{
    HostBudget, MemoryOptions, buffer_sets_for, keeps_in_place, load_target, plan_with,
    read_buffer_bytes,
};
use common::*;

fn gpu(budget: u64, host: Option<HostBudget>) -> MemoryOptions {
    MemoryOptions {
        base: Some(0),
        context: 64,
        logit_rows: 3,
        draft_logit_rows: 1,
        host_cache: true,
        host,
        ..MemoryOptions::new(budget, true)
    }
}

#[test]
fn the_host_tier_serves_what_fits_and_the_disk_the_rest() {
    // Layers large enough next to their read buffers' alignment that
    // streaming them saves memory.
    let wide = |arch, ty, tied, seed| arbor_model::testing::TinyModel {
        hidden: 256,
        ffn: 512,
        ..tiny(arch, ty, tied, seed)
    };
    for tiny in [
        wide("qwen2", GgmlType::Q8_0, false, 31),
        wide("llama", GgmlType::F16, true, 32),
    ] {
        let file = TempModel::new(&tiny, "host-tier");
        let want = bits(&session(&mut resident_model(file.path())).unwrap());
        let gguf = GgufFile::open(file.path()).unwrap();
        let layout = Layout::from_gguf(gguf.header()).unwrap();
        let backend = CandleBackend::new();
        let whole = plan_with(&backend, &gguf, None, 0, &gpu(1 << 40, None))
            .unwrap()
            .unwrap();
        assert_eq!(whole.streamed(), 0);
        // The smallest GPU budget that runs: it streams the most layers.
        let fits = |b: u64| {
            plan_with(&backend, &gguf, None, 0, &gpu(b, None))
                .unwrap()
                .is_some()
        };
        let (mut lo, mut hi) = (0, whole.fixed + 8 * whole.resident_bytes);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            *(if fits(mid) { &mut hi } else { &mut lo }) = mid;
        }
        let budget = hi;
        let plan = plan_with(&backend, &gguf, None, 0, &gpu(budget, None))
            .unwrap()
            .unwrap();
        let streamed: Vec<usize> = (0..LAYERS).filter(|&l| !plan.resident[l]).collect();
        assert!(streamed.len() >= 3, "{} streamed", streamed.len());
        let layer_bytes = |l: usize| -> u64 { layout.layers[l].iter().map(|e| e.len as u64).sum() };
        // On the CPU backend the streamed weights stay in their buffers
        // (three sets); a GPU's uploads copy them (two).
        let lists: Vec<&[arbor_model::TensorEntry]> =
            streamed.iter().map(|&l| &layout.layers[l][..]).collect();
        let in_place = keeps_in_place(&backend, plan_mode(), &lists);
        let buffers =
            read_buffer_bytes(&layout, &streamed) * buffer_sets_for(plan_mode(), in_place);
        let host = |room: u64| {
            let fixed = HostBudget {
                budget: 0,
                base: Some(0),
            }
            .fixed(buffers);
            HostBudget {
                budget: fixed + room,
                base: Some(0),
            }
        };
        // The tier takes streamed layers in forward order while they fit.
        let two = layer_bytes(streamed[0]) + layer_bytes(streamed[1]);
        for (room, held) in [
            (0, 0),
            (two, 2),
            (two - 1, 1),
            (u64::MAX / 4, streamed.len()),
        ] {
            let (mut model, report) = load_target(
                backend.clone(),
                &gguf,
                None,
                &gpu(budget, Some(host(room))),
                &mut |_, _| {},
            )
            .unwrap();
            assert_eq!(report.plan.resident, plan.resident);
            let held_bytes: u64 = streamed[..held].iter().map(|&l| layer_bytes(l)).sum();
            assert_eq!(report.host_held, (held, held_bytes), "room {room}");
            assert_eq!(
                report.disk_read_per_pass,
                report.plan.read_per_pass - held_bytes
            );
            let got = bits(&session(&mut model).unwrap());
            assert!(got == want, "room {room}: logits differ");
            let stats = report.monitor.as_ref().unwrap().stats();
            assert_eq!(stats.host_bytes > 0, held > 0, "room {room}");
            // The disk serves the layers the tier does not hold, and the
            // head where it is read per pass.
            let from_disk = held < streamed.len() || plan.head_read > 0;
            assert_eq!(stats.bytes > 0, from_disk, "room {room}");
            if held > 0 {
                assert!(report.summary().contains("host memory holds"));
            }
        }
        // A GPU budget alone reads through the page cache: no disk reads
        // per pass are counted; a host budget alone reads them all.
        let (_, cached) = load_target(
            backend.clone(),
            &gguf,
            None,
            &gpu(budget, None),
            &mut |_, _| {},
        )
        .unwrap();
        assert_eq!((cached.disk_read_per_pass, cached.host_held), (0, (0, 0)));
        let host_only = MemoryOptions {
            host_cache: false,
            ..gpu(budget, None)
        };
        let (_, direct) =
            load_target(backend.clone(), &gguf, None, &host_only, &mut |_, _| {}).unwrap();
        assert_eq!(direct.disk_read_per_pass, direct.plan.read_per_pass);
        // Host memory that cannot hold the read buffers.
        let small = HostBudget {
            budget: host(0).budget - 1,
            base: Some(0),
        };
        let err = load_target(
            backend.clone(),
            &gguf,
            None,
            &gpu(budget, Some(small)),
            &mut |_, _| {},
        )
        .err()
        .expect("a host budget below its minimum loads nothing");
        let text = err.to_string();
        assert!(
            text.contains("too small") && text.contains("host memory"),
            "{text}"
        );
    }
}

fn plan_mode() -> arbor_pipeline::Mode {
    gpu(0, None).mode
}
