//! Saving a rank's checkpoint copies no more than one tensor at a time: the writer takes each
//! tensor's bytes from the tensor itself (or a copy of that one tensor), never a copy of every
//! tensor the rank holds, which would double its memory at every save. The bytes the process
//! holds are watched through the allocator while a store of many tensors is written, in both
//! formats, and the files read back equal.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use autopar_runtime::checkpoint_io::{load_checkpoint, save_checkpoint};
use autopar_runtime::ParamStore;
use autopar_tensor::Tensor;

/// The system allocator, counting the bytes held and their peak since the last reset.
struct Count;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = HELD.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

unsafe impl GlobalAlloc for Count {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        grew(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Count = Count;

const TENSORS: usize = 24;
const ELEMENTS: usize = 256 * 1024; // 1 MiB of f32 each

#[test]
fn a_checkpoint_is_written_without_a_copy_of_the_tensors() {
    let mut store = ParamStore::new();
    for i in 0..TENSORS {
        let values: Vec<f32> = (0..ELEMENTS).map(|j| (i * ELEMENTS + j) as f32 * 1e-3).collect();
        store.insert(&format!("layer{i:02}.weight"), Tensor::from_vec(&[512, 512], values).unwrap());
    }
    // A transposed view is not contiguous: it is copied, alone.
    let t = autopar_tensor::kernels::shape::transpose(store.get("layer00.weight").unwrap(), &[1, 0]).unwrap();
    store.insert("layer00.weight_t", t);
    let total = (TENSORS + 1) * ELEMENTS * 4;
    let dir = tempfile::tempdir().unwrap();
    for file in ["net.safetensors", "net.ckpt"] {
        let path = dir.path().join(file);
        let before = HELD.load(Ordering::Relaxed);
        PEAK.store(before, Ordering::Relaxed);
        save_checkpoint(&store, &path, &BTreeMap::new()).unwrap();
        let extra = PEAK.load(Ordering::Relaxed) - before;
        // One tensor's copy and the writer's buffers, not the store's bytes again.
        assert!(extra < total / 4, "{file}: saving {total} bytes of tensors held {extra} bytes more at its peak");
        let back = load_checkpoint(&path).unwrap();
        for (name, t) in store.iter() {
            let got = back.get(name).unwrap_or_else(|| panic!("{file}: {name} missing"));
            assert_eq!(got.shape(), t.shape(), "{file}: {name}");
            assert_eq!(got.to_vec::<f32>().unwrap(), t.to_vec::<f32>().unwrap(), "{file}: {name}");
        }
    }
}
