"""A small job whose driver classes `redelivery spark-cds` records into a class-data sharing
archive: a session, a small job on the SparkContext and a DataFrame job, the classes a driver
loads first whatever the job."""

from pyspark.sql import SparkSession

spark = SparkSession.builder.appName("redelivery-cds").getOrCreate()
spark.sparkContext.parallelize(range(4), 2).map(lambda x: x * 2).collect()
spark.createDataFrame([(1, "a")], "n int, s string").selectExpr("to_json(struct(*))").collect()
spark.stop()
