//! The pool in a browser: allocate, write, read (awaited), free and reuse only after a
//! submission, growth, trim, the budget and its out-of-memory explanation, typed refusals.

use wasm_bindgen_test::wasm_bindgen_test;
use wgpu_pool::{AllocOptions, Pool, PoolError, PoolOptions};

use crate::support::{gpu, pool};

#[wasm_bindgen_test]
async fn the_adapter_is_the_browsers_webgpu() {
    let gpu = gpu().await;
    assert_eq!(gpu.info.backend, wgpu::Backend::BrowserWebGpu, "{gpu}");
}

#[wasm_bindgen_test]
async fn a_write_reads_back_awaited() {
    let pool = pool().await;
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    let allocation = pool.allocate(data.len() as u64).unwrap();
    pool.write(&allocation, 0, &data).unwrap();
    pool.submit([]);
    assert_eq!(pool.read_async(&allocation).await.unwrap(), data);
}

#[wasm_bindgen_test]
async fn typed_reads_and_writes_round_trip() {
    let pool = pool().await;
    let values: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 3.0).collect();
    let allocation = pool.allocate(4000).unwrap();
    pool.write_slice(&allocation, 0, &values).unwrap();
    let back: Vec<f32> = pool.read_vec_async(&allocation).await.unwrap();
    assert_eq!(back, values);
    // A whole number of elements or a typed refusal.
    let odd = pool.allocate(6).unwrap();
    assert!(matches!(
        pool.read_vec_async::<f32>(&odd).await,
        Err(PoolError::ElementSize { .. })
    ));
}

#[wasm_bindgen_test]
async fn a_blocking_read_is_refused_with_the_async_form_named() {
    let pool = pool().await;
    let allocation = pool.allocate(256).unwrap();
    match pool.read(&allocation) {
        Err(PoolError::ReadBack(message)) => {
            assert!(message.contains("_async"), "{message}");
        }
        other => panic!("a blocking read in a browser: {other:?}"),
    }
    // The pool is still usable, and its data intact.
    pool.write(&allocation, 0, &[9u8; 256]).unwrap();
    assert_eq!(pool.read_async(&allocation).await.unwrap(), vec![9u8; 256]);
}

#[wasm_bindgen_test]
async fn allocate_async_awaits_the_devices_word_on_new_segments() {
    let pool = pool().await;
    let first = pool.allocate_async(64 << 20).await.unwrap();
    let second = pool
        .allocate_with_async(1 << 20, AllocOptions::labeled("second"))
        .await
        .unwrap();
    assert_eq!(second.label(), "second");
    assert!(pool.stats().segments.current >= 1);
    pool.write(&first, 0, &[1u8; 64]).unwrap();
    let bytes = pool.read_async(&first).await.unwrap();
    assert_eq!(&bytes[..64], &[1u8; 64]);
    assert!(matches!(
        pool.allocate_async(0).await,
        Err(PoolError::ZeroSize)
    ));
}

#[wasm_bindgen_test]
async fn a_dropped_range_is_reused_only_after_a_submission() {
    let pool = pool().await;
    let keep = pool.allocate(1 << 20).unwrap();
    let first = pool.allocate(1 << 20).unwrap();
    let place = (first.segment(), first.offset());
    drop(first);
    assert_eq!(pool.pending_frees().0, 1);
    let second = pool.allocate(1 << 20).unwrap();
    let second_place = (second.segment(), second.offset());
    assert_ne!(
        second_place, place,
        "reused before the work that may use it was submitted"
    );
    drop(second);
    pool.submit([]);
    assert_eq!(pool.pending_frees().0, 0);
    let third = pool.allocate(1 << 20).unwrap();
    assert!(
        [place, second_place].contains(&(third.segment(), third.offset())),
        "after the submission a freed range serves again"
    );
    assert_ne!(
        (third.segment(), third.offset()),
        (keep.segment(), keep.offset())
    );
    assert_eq!(pool.stats().allocations.current, 2);
}

#[wasm_bindgen_test]
async fn free_submitted_makes_a_range_reusable_at_once() {
    let pool = pool().await;
    let first = pool.allocate(4 << 20).unwrap();
    let place = (first.segment(), first.offset());
    pool.free_submitted([first]);
    assert_eq!(pool.pending_frees().0, 0);
    let second = pool.allocate(4 << 20).unwrap();
    assert_eq!((second.segment(), second.offset()), place);
}

#[wasm_bindgen_test]
async fn the_pool_grows_by_segments_and_trim_gives_empty_ones_back() {
    let pool = pool().await;
    let held: Vec<_> = (0..6).map(|_| pool.allocate(48 << 20).unwrap()).collect();
    let stats = pool.stats();
    assert!(stats.segments.current >= 2, "{stats:?}");
    assert!(stats.reserved_bytes.current >= 6 * (48 << 20), "{stats:?}");
    let limit = pool.gpu().device.limits().max_buffer_size;
    for segment in pool.segments() {
        assert!(
            segment.size_bytes <= limit,
            "{segment:?} past max_buffer_size {limit}"
        );
    }
    drop(held);
    pool.submit([]);
    let released = pool.trim();
    assert!(released >= 6 * (48 << 20), "released {released}");
    assert_eq!(pool.stats().reserved_bytes.current, 0);
    assert_eq!(pool.stats().segments.current, 0);
}

#[wasm_bindgen_test]
async fn the_budget_refuses_with_its_figures() {
    let pool = pool().await;
    pool.set_budget(Some(8 << 20));
    let fits = pool.allocate(4 << 20).unwrap();
    let error = pool.allocate(16 << 20).expect_err("beyond the budget");
    let PoolError::OutOfMemory(oom) = &error else {
        panic!("not an out-of-memory error: {error:?}");
    };
    assert_eq!(oom.budget_bytes, Some(8 << 20));
    assert_eq!(oom.requested_bytes, 16 << 20);
    let text = error.to_string();
    assert!(
        text.contains("out of memory") && text.contains("budget"),
        "{text}"
    );
    assert_eq!(pool.stats().oom_count, 1);
    // Nothing was lost: the allocation that fitted still holds its data.
    pool.write(&fits, 0, &[5u8; 16]).unwrap();
    assert_eq!(&pool.read_async(&fits).await.unwrap()[..16], &[5u8; 16]);
    pool.set_budget(None);
    pool.allocate(16 << 20).expect("fits without the budget");
}

#[wasm_bindgen_test]
async fn the_oom_explanation_names_fragmentation() {
    let pool = pool().await;
    // Holes: every other 1 MiB range of a segment freed.
    let ranges: Vec<_> = (0..16).map(|_| pool.allocate(1 << 20).unwrap()).collect();
    let reserved = pool.stats().reserved_bytes.current;
    pool.set_budget(Some(reserved));
    let mut kept = Vec::new();
    for (i, range) in ranges.into_iter().enumerate() {
        if i % 2 == 0 {
            kept.push(range);
        }
    }
    pool.submit([]);
    let error = pool.allocate(4 << 20).expect_err("no hole is large enough");
    let PoolError::OutOfMemory(oom) = &error else {
        panic!("{error:?}");
    };
    assert!(oom.free_bytes >= 8 << 20, "{oom:?}");
    assert!(oom.largest_free_bytes < 4 << 20, "{oom:?}");
    assert!(oom.external_fragmentation > 0.0, "{oom:?}");
    assert!(error.to_string().contains("largest free block"), "{error}");
}

#[wasm_bindgen_test]
async fn bad_requests_get_typed_errors_naming_the_limit() {
    let pool = pool().await;
    let limits = pool.gpu().device.limits();
    assert!(matches!(pool.allocate(0), Err(PoolError::ZeroSize)));
    let past_binding = limits.max_storage_buffer_binding_size + 4;
    match pool.allocate(past_binding) {
        Err(error @ PoolError::ExceedsBindingLimit { .. }) => {
            assert!(error
                .to_string()
                .contains("max_storage_buffer_binding_size"))
        }
        other => panic!("{other:?}"),
    }
    match pool.allocate_with(
        limits.max_buffer_size + 4,
        AllocOptions {
            bindable: false,
            ..AllocOptions::default()
        },
    ) {
        Err(error @ PoolError::ExceedsBufferLimit { .. }) => {
            assert!(error.to_string().contains("max_buffer_size"))
        }
        other => panic!("{other:?}"),
    }
    let allocation = pool.allocate(64).unwrap();
    assert!(matches!(
        pool.write(&allocation, 62, &[0u8; 4]),
        Err(PoolError::OutOfBounds { .. })
    ));
    assert_eq!(pool.stats().allocations.current, 1);
}

#[wasm_bindgen_test]
async fn an_allocation_of_another_pool_is_refused_untouched() {
    let gpu = gpu().await;
    let ours = Pool::new(&gpu, PoolOptions::default()).unwrap();
    let theirs = Pool::new(&gpu, PoolOptions::default()).unwrap();
    let allocation = theirs.allocate(256).unwrap();
    theirs.write(&allocation, 0, &[3u8; 256]).unwrap();
    assert!(matches!(
        ours.write(&allocation, 0, &[0u8; 4]),
        Err(PoolError::ForeignAllocation { .. })
    ));
    assert_eq!(
        theirs.read_async(&allocation).await.unwrap(),
        vec![3u8; 256]
    );
}

#[wasm_bindgen_test]
async fn zeroed_allocations_read_zero_after_reuse() {
    let pool = pool().await;
    let dirty = pool.allocate(1 << 16).unwrap();
    pool.write(&dirty, 0, &[0xAB; 1 << 16]).unwrap();
    pool.submit([]);
    pool.free_submitted([dirty]);
    let clean = pool
        .allocate_with(
            1 << 16,
            AllocOptions {
                zeroed: true,
                ..AllocOptions::default()
            },
        )
        .unwrap();
    assert!(pool
        .read_async(&clean)
        .await
        .unwrap()
        .iter()
        .all(|&b| b == 0));
}

/// An error the device reports outside any scope (here a buffer past the device's limit, made
/// on the device directly) is kept, and the next awaited read refuses rather than hand out a
/// result of work the device may have refused; the reads after it serve again.
#[wasm_bindgen_test]
async fn a_device_error_is_reported_by_the_next_read_not_lost() {
    let pool = pool().await;
    let allocation = pool.allocate(256).unwrap();
    pool.write(&allocation, 0, &[7u8; 256]).unwrap();
    let limit = pool.gpu().device.limits().max_buffer_size;
    let _refused = pool.gpu().device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("past the limit"),
        size: limit + 4,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    match pool.read_async(&allocation).await {
        Err(error @ PoolError::DeviceReported(_)) => {
            assert!(error.to_string().contains("reported"), "{error}");
        }
        other => panic!("the device's error was lost: {other:?}"),
    }
    assert!(
        pool.gpu().take_device_errors().is_empty(),
        "taken by the read"
    );
    assert_eq!(pool.read_async(&allocation).await.unwrap(), vec![7u8; 256]);
}
